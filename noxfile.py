"""Developer sessions: `nox` runs lint, typecheck and tests; `nox -s tests -- -k nouveau` passes args to pytest."""

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "gpunode", "tests", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy", "types-requests", "types-paramiko", "types-PyYAML")
    session.run("mypy")


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Benchmarks on node-simulator nodes (root, openssh-server): `nox -s bench -- --latency`. Never part of
    the default sessions or of the test suite. Ansible and pyinfra go to a throwaway venv (.venv-bench)."""
    session.run("python3", "-m", "venv", ".venv-bench", external=True)
    session.run(".venv-bench/bin/pip", "install", "-q", "-e", ".[bench]", external=True)
    session.run(".venv-bench/bin/python", "-m", "benchmarks.bench", *session.posargs, external=True)
