"""What a sandboxed kernel uses, read from /proc and the file system (the watchdog's measurements)."""
from __future__ import annotations

import os
import stat
from pathlib import Path


def usage(pids: list[int]) -> tuple[int, int, float]:
    """(tasks, anonymous+shmem resident bytes, CPU seconds including reaped children) over `pids`."""
    tasks = mem = 0
    ticks = 0
    hz = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/status") as f:
                status_text = f.read()
        except OSError:
            continue
        if len(fields) < 18:  # read while the process was being reaped
            continue
        ticks += sum(int(x) for x in fields[11:15])        # utime stime cutime cstime
        tasks += int(fields[17])                          # num_threads
        for key in ("RssAnon:", "RssShmem:"):
            i = status_text.find(key)
            if i >= 0:
                mem += int(status_text[i + len(key):].split()[0]) * 1024
    return tasks, mem, ticks / hz


def pss(pids: list[int]) -> int:
    """Proportional anonymous+shmem memory (fork-shared pages counted once), bytes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
        except OSError:
            continue
        found = False
        for key in ("Pss_Anon:", "Pss_Shmem:"):
            i = text.find(key)
            if i >= 0:
                found = True
                total += int(text[i + len(key):].split()[0]) * 1024
        if not found:
            i = text.find("Pss:")
            total += int(text[i + 4:].split()[0]) * 1024 if i >= 0 else 0
    return total


def dir_bytes(paths: list[Path], cap: int = 50_000) -> tuple[int, int]:
    """(bytes, entries) under `paths`, without following links; stops counting entries at `cap`."""
    total = entries = 0
    stack = [str(p) for p in paths]
    while stack and entries < cap:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    entries += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    else:
                        total += st.st_blocks * 512
        except OSError:
            pass
    return total, entries
