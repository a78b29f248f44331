"""gpunode.explain.normalise: a paste becomes the logical lines the program printed."""

from __future__ import annotations

import textwrap

from gpunode.explain import normalise

# ---------------------------------------------------------------------------------------------------------


def test_normalise_strips_ansi_prompts_quotes_and_timestamps():
    text = ("> \x1b[32m(base) alice@gpu-01:~/work$\x1b[0m nvidia-smi\n"
            "> [  123.456789] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
            "> Jan 02 03:04:05 gpu-01 kernel: [  124.000001] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n"
            "> 6,3964,206764307,-;nvidia-nvswitch2: open (major=510)\n"
            "> [Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13\n"
            "> kern  :err   : [ 5.000000] nvidia: probe failed\n"
            "> [root@node ~]# modprobe nvidia\n"
            "> $ echo \u201cquoted\u201d \u2018single\u2019")
    assert normalise(text).splitlines() == [
        "nvidia-smi",
        "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "nvidia-nvswitch2: open (major=510)",
        "NVRM: Xid (PCI:0000:cb:00): 13",
        "nvidia: probe failed",
        "modprobe nvidia",
        "echo \"quoted\" 'single'",
    ]


def test_normalise_rejoins_wrapped_and_continued_lines():
    installer = ("ERROR: The Nouveau kernel driver is currently in use by your\n"
                 "       system.  This driver is incompatible with the NVIDIA\n"
                 "       driver.\n\n\n"
                 "ERROR: Installation has failed.")
    assert normalise(installer) == ("ERROR: The Nouveau kernel driver is currently in use by your system. This driver "
                                    "is incompatible with the NVIDIA driver.\n\nERROR: Installation has failed.")
    kernel = ("[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
              "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
              "               NVRM: fallen off the bus and is not responding to commands.\n"
              "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).")
    assert normalise(kernel).splitlines() == [
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen off the bus and "
        "is not responding to commands.",
        "NVRM: The NVIDIA probe routine failed for 1 device(s).",
    ]
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.")
    for width in (64, 100):  # (at 80 the break falls after a full stop, which also ends log messages)
        assert normalise(textwrap.fill(message, width)) == message
    split = "ERROR: Unable to load the kernel module 'nvidia-drm' because nvidia-\ndrm is in use by the X server"
    assert normalise(split) == split.replace("-\n", "-")


def test_normalise_keeps_separate_records_apart():
    text = ("$ nvidia-smi\nFailed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.124\n"
            "NVRM: Xid (PCI:0000:01:00): 13, pid=1, a\nNVRM: Xid (PCI:0000:01:00): 13, pid=2, b")
    assert normalise(text).splitlines() == [
        "nvidia-smi", "Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 570.124",
        "NVRM: Xid (PCI:0000:01:00): 13, pid=1, a", "NVRM: Xid (PCI:0000:01:00): 13, pid=2, b"]


def test_normalise_unescapes_quoted_go_errors_and_collapses_whitespace():
    text = 'caused \\\\\\"error running hook\\\\\\\\nnvidia-container-cli: x\\\\n\\\\\\"\\"":   unknown.\t\tend'
    assert normalise(text).splitlines() == ['caused "error running hook', "nvidia-container-cli: x",
                                            '""": unknown. end']


def test_normalise_strips_markdown_code_and_bold_and_treats_a_fence_as_a_paragraph_break():
    text = ("I get the error\n`docker: Error response from daemon: x`\n**nvidia-smi: y**\n```bash\n$ nvidia-smi\n```\n"
            "after the fence")
    assert normalise(text).splitlines() == ["I get the error", "docker: Error response from daemon: x",
                                            "nvidia-smi: y", "", "nvidia-smi", "", "after the fence"]


def test_normalise_strips_journal_lines_without_host_and_go_log_stamps():
    text = ("     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out\n"
            "sep 03 13:25:15 cachyos kernel: NVRM: loading NVIDIA UNIX Open Kernel Module\n"
            "2019/07/23 14:19:45 ERROR: inject NVIDIA hook: stat /usr/bin/nvidia-container-runtime-hook: no such file")
    assert normalise(text).splitlines() == [
        "NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out",
        "NVRM: loading NVIDIA UNIX Open Kernel Module",
        "ERROR: inject NVIDIA hook: stat /usr/bin/nvidia-container-runtime-hook: no such file"]


def test_a_terminal_cut_inside_a_word_is_joined_without_a_space_only_in_the_terminal_reading():
    message = ('docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].')
    cut = message[:80] + "\n" + message[80:]  # "...with capab" / "ilities: [[gpu]]."
    assert normalise(cut, terminal=True) == message
    assert normalise(cut) != message  # a program's word wrap is the default reading
    wrapped = textwrap.fill(message, 70)
    assert normalise(wrapped) == message


def test_tables_are_not_joined_as_terminal_wraps():
    table = ("+-----------------------------------------------------------------------------+\n"
             "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |\n"
             "+-----------------------------------------------------------------------------+")
    assert normalise(table, terminal=True) == normalise(table)


def test_a_message_on_the_same_line_as_a_fence_is_kept():
    assert normalise("```docker: Error response from daemon: could not select device driver```") == \
        "docker: Error response from daemon: could not select device driver"
    assert normalise("~~~Failed to initialize NVML: Unknown Error\n~~~") == "Failed to initialize NVML: Unknown Error"
    assert normalise("```bash\n$ nvidia-smi\nNo devices were found\n```") == "nvidia-smi\nNo devices were found"
    assert normalise("```CUDA_ERROR_NO_DEVICE```") == "CUDA_ERROR_NO_DEVICE"


def test_markdown_and_chat_pastes():
    # a list item starts a line of its own, whatever the marker
    assert normalise("- No devices were found\n* Failed to initialize NVML: Unknown Error\n2) done") == \
        "No devices were found\nFailed to initialize NVML: Unknown Error\ndone"
    # a Markdown table: each cell its own paragraph (nvidia-smi's +---+ tables are not Markdown tables)
    table = "| tool | output |\n|---|:---:|\n| nvidia-smi | No devices were found |"
    assert "\nNo devices were found" in normalise(table) and "|" not in normalise(table)
    smi = "+------+------+\n| GPU  Name    | Bus-Id |\n|======+======|\n"
    assert "|" in normalise(smi)
    # a chat client's time stamp, HTML line breaks and <details> blocks
    assert normalise("[10:42 AM] No devices were found") == "No devices were found"
    assert normalise("<details><summary>log</summary>\nNo devices were found<br>done</details>") == \
        "log\nNo devices were found\ndone"


def test_html_entities_of_a_web_or_mail_copy_are_decoded():
    assert normalise("could not select device driver &quot;&quot; with capabilities: [[gpu]]") == \
        'could not select device driver "" with capabilities: [[gpu]]'
    assert normalise("exec: &#34;nvidia-smi&#34;: executable file not found in $PATH &amp;&amp; 5 &gt; 4") == \
        'exec: "nvidia-smi": executable file not found in $PATH && 5 > 4'
    assert normalise("a &notanentity; stays") == "a &notanentity; stays"


def test_bold_italic_markup_inside_a_pasted_message_is_dropped_but_underscores_of_names_stay():
    line = ("stderr: **_nvidia-container-cli: mount error: mount operation failed:_** "
            "/merged/proc/driver/nvidia/params/version/registry_**: no such file or directory")
    assert normalise(line) == ("stderr: nvidia-container-cli: mount error: mount operation failed: "
                               "/merged/proc/driver/nvidia/params/version/registry: no such file or directory")
    assert normalise("libnvidia_ml_loader failed: CUDA_ERROR_NO_DEVICE") == \
        "libnvidia_ml_loader failed: CUDA_ERROR_NO_DEVICE"


def test_pythons_double_underscore_names_stay_whole_while_double_underscore_bold_is_dropped():
    assert normalise("RuntimeError: __init__ failed: no CUDA GPUs are available") == \
        "RuntimeError: __init__ failed: no CUDA GPUs are available"
    assert normalise('  File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 302, in _lazy_init') == \
        'File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 302, in _lazy_init'
    assert normalise("  raise in __call__") == "raise in __call__"
    # bold written with underscores, at the start of the line as elsewhere, is still markup
    assert normalise("__docker: Error response from daemon__ here") == "docker: Error response from daemon here"
    assert normalise("see __could not select device driver__") == "see could not select device driver"
