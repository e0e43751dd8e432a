"""The grading sandbox (grader/sandbox/) and the kernel's integrity guard (grader/guard/).

Tests 1, 2, 4, 6 and 7 grade a tiny fixture course with plain `nbgrader autograde`: once with
`--Execute.kernel_manager_class=grader.sandbox.SandboxedKernelManager` and once without, where the attacks are
shown to work. Tests 3 and 5, and the extra ones, start kernels through jupyter_client directly. Everything is
skipped, with the reason, where grader.sandbox.status() says no sandbox can be made (no bwrap, no Linux).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import socket
import sqlite3
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from grader import nbtools, sandbox
from grader.release import generate

AVAILABLE, WHY = sandbox.status()
needs_sandbox = pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox can be made on this machine: {WHY}")
KM = "grader.sandbox.SandboxedKernelManager"
MARK = b"VANDALISED"


# ---- the fixture course -----------------------------------------------------------------------------------------
def _code(source: str, **nbgrader) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(textwrap.dedent(source).strip())
    if nbgrader:
        cell.metadata["nbgrader"] = {"schema_version": 3, "locked": False, "solution": False, "grade": False,
                                     **nbgrader}
    return cell


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Fixture")] + list(cells)
    return nb


BASIC = _notebook(
    _code("from course import checks", grade_id="setup", locked=True),
    _code("""
        def square(x):
            ### BEGIN SOLUTION
            return x * x
            ### END SOLUTION
        """, grade_id="square", solution=True),
    _code('''
        """Check that square squares numbers."""
        def __check_square():
            from course import checks
            checks.check(square(3) == 9, "square(3) should be 9", "multiply x by itself")
            ### BEGIN HIDDEN TESTS
            for v in (-2, 0, 7):
                assert square(v) == v * v, f"square({v})"
            assert isinstance(square(2), int)
            ### END HIDDEN TESTS
        __check_square(); del __check_square
        ''', grade_id="test_square", grade=True, locked=True, points=2),
    _code("""
        def describe(xs):
            ### BEGIN SOLUTION
            return {"n": len(xs), "mean": sum(xs) / len(xs)}
            ### END SOLUTION
        """, grade_id="describe", solution=True),
    _code('''
        """Check describe's count and mean."""
        def __check_describe():
            import course.checks
            got = describe([1, 2, 3, 6])
            course.checks.expect_equal(got["n"], 4, "the count")
            ### BEGIN HIDDEN TESTS
            assert abs(got["mean"] - 3.0) < 1e-12, "the mean"
            ### END HIDDEN TESTS
        __check_describe(); del __check_describe
        ''', grade_id="test_describe", grade=True, locked=True, points=1),
)
TENSORS = _notebook(
    _code("import torch", grade_id="setup_t", locked=True),
    _code("""
        def double(t):
            ### BEGIN SOLUTION
            return t * 2
            ### END SOLUTION
        """, grade_id="double", solution=True),
    _code('''
        """Check double on a tensor."""
        def __check_double():
            import torch
            t = torch.arange(4.0)
            torch.testing.assert_close(double(t), t * 2)
        __check_double(); del __check_double
        ''', grade_id="test_double", grade=True, locked=True, points=1),
)
THIEF = """
    def __steal():
        import json, pathlib
        here = pathlib.Path.cwd()
        for up in list(here.parents)[:3]:
            for nb in sorted(up.glob("*/*.ipynb")) + sorted(up.glob("*/*/*.ipynb")):
                try:
                    cells = json.loads(nb.read_text())["cells"]
                except Exception:
                    continue
                for cell in cells:
                    src = "".join(cell["source"])
                    if "### BEGIN SOLUTION" in src and "NotImplementedError" not in src:
                        exec(src, globals())
    __steal()
    """
VANDAL = """
    def square(x):
        return x * x
    def __vandalise():
        import json, os, pathlib
        here = pathlib.Path.cwd()
        seen, written = [], []
        mark = ("VANDAL" + "ISED").encode()            # never spelled out in this notebook's own source
        def attempt(path, data=mark):
            try:
                with open(path, "ab") as f:
                    f.write(data)
                written.append(str(path))
            except OSError:
                pass
        tops = list(here.parents)[:3] + [here.parents[3] / "instructor_home"]
        attempt(here.parents[2] / "gradebook.db")
        for top in tops:
            for dirpath, dirs, files in os.walk(top):
                d = pathlib.Path(dirpath)
                if d == here or here in d.parents:
                    continue
                for name in files:
                    seen.append(str(d / name))
                    attempt(d / name)
                attempt(d / "vandal.txt")
        (here / "mine.txt").write_bytes(mark + b" " + json.dumps({"seen": seen, "written": written}).encode())
    __vandalise()
    """
BOMB = """
    hog = []
    while True:
        hog.append(b"x" * (64 << 20))
    """
TAMPER_BASIC = """
    import builtins, course.checks
    from IPython.core.interactiveshell import InteractiveShell
    course.checks.check = lambda *a, **k: None
    course.checks.expect_equal = lambda *a, **k: None
    _isinstance = builtins.isinstance
    builtins.isinstance = lambda obj, cls: (cls is int and type(obj) is float) or _isinstance(obj, cls)
    abs = lambda *a: 0
    def _swallow(*a, **k):
        return None
    get_ipython().showtraceback = _swallow
    InteractiveShell.showtraceback = _swallow
    async def _run_code(self, code_obj, result=None, *, async_=False):
        try:
            exec(code_obj, self.user_global_ns, self.user_ns)
        except BaseException:
            pass
        return False
    InteractiveShell.run_code = _run_code
    """
TAMPER_TENSORS = """
    import torch.testing
    torch.testing.assert_close = lambda *a, **k: None
    """
RIGHT = {"square": "def square(x):\n    return x * x",
         "describe": 'def describe(xs):\n    return {"n": len(xs), "mean": sum(xs) / len(xs)}',
         "double": "def double(t):\n    return t * 2"}
# Each wrong answer fails one check that one of the tampering tricks would wave through.
WRONG = {"square": "def square(x):\n    return float(x * x)",                                   # isinstance
         "describe": 'def describe(xs):\n    return {"n": len(xs) + 1, "mean": sum(xs) / len(xs) + 1}',  # checks, abs
         "double": "def double(t):\n    return t * 3"}                                          # assert_close
# student -> notebook -> edits: {grade_id of a solution cell: its new source, "+after:<grade_id>": an added cell};
# None: the released notebook as it is
STUDENTS = {
    "honest_a": {"basic": {**RIGHT}, "tensors": {**RIGHT}},
    "honest_b": {"basic": {**WRONG}, "tensors": {**WRONG}},     # unsandboxed: basic only (one torch kernel less)
    "thief": {"basic": {"square": THIEF, "describe": "# taken care of above"}},
    "vandal": {"basic": {**RIGHT, "square": VANDAL}},
    "bomb": {"basic": {**RIGHT, "square": BOMB}},
    "tamper": {"basic": {**WRONG, "+after:setup": TAMPER_BASIC},
               "tensors": {**WRONG, "+after:setup_t": TAMPER_TENSORS}},
}
PLAIN = ("honest_a", "honest_b", "thief", "tamper")   # never run the vandal or the bomb unsandboxed
SLOW_MACHINE = ["--Execute.iopub_timeout=30"]       # shared 2-core machines: output may lag the reply


def _submission(released: Path, edits: dict | None) -> nbformat.NotebookNode:
    nb = nbformat.read(released, as_version=4)
    if edits is None:
        return nb
    for key, source in edits.items():
        if key.startswith("+after:"):
            index = next(i for i, c in enumerate(nb.cells) if nbtools.grade_id(c) == key[7:])
            nb.cells.insert(index + 1, nbformat.v4.new_code_cell(textwrap.dedent(source).strip()))
    for cell in nb.cells:
        gid = nbtools.grade_id(cell)
        if gid in edits and nbtools.nbgrader_meta(cell).get("solution"):
            cell.source = textwrap.dedent(edits[gid]).strip()
    return nb


def _submit(root: Path, released: Path, students, skip=()) -> None:
    for student in students:
        folder = root / "submitted" / student / "ps1"
        folder.mkdir(parents=True)
        for name, edits in STUDENTS[student].items():
            if (student, name) in skip:
                continue
            nbformat.write(_submission(released / f"{name}.ipynb", edits), folder / f"{name}.ipynb")


def _scores(root: Path) -> dict[tuple[str, str, str], float]:
    return {(r.student, r.notebook, r.grade_id): r.score for r in nbtools.cell_scores(root, "ps1")}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The fixture class graded twice: sandboxed (course "boxed") and with plain nbgrader (course "plain")."""
    tmp = tmp_path_factory.mktemp("sandbox")
    boxed, plain = tmp / "boxed", tmp / "plain"
    (boxed / "solutions" / "ps1").mkdir(parents=True)
    nbformat.write(BASIC, boxed / "solutions" / "ps1" / "basic.ipynb")
    nbformat.write(TENSORS, boxed / "solutions" / "ps1" / "tensors.ipynb")
    released = generate(["ps1"], boxed / "solutions", boxed) / "ps1"
    shutil.copytree(boxed, plain)
    home = tmp / "instructor_home"
    home.mkdir()
    (home / "notes.txt").write_text("private\n")
    _submit(boxed, released, STUDENTS)
    _submit(plain, plain / "exercises" / "ps1", PLAIN, skip={("honest_b", "tensors")})
    events = tmp / "events.jsonl"
    env = {"GRADER_SANDBOX": "require", "GRADER_SANDBOX_MEMORY": "1G", "GRADER_SANDBOX_EVENTS": str(events)}

    def grade_boxed() -> str:
        try:
            nbtools.nbgrader("autograde", "ps1", f"--Execute.kernel_manager_class={KM}", *SLOW_MACHINE,
                             root=boxed, env=env, timeout=600)
            return ""
        except RuntimeError as exc:      # a notebook that fails to grade: nbgrader says so at the end
            return str(exc)

    with ThreadPoolExecutor(2) as pool:  # the two courses are independent: grade them side by side
        boxed_run = pool.submit(grade_boxed)
        plain_run = pool.submit(nbtools.nbgrader, "autograde", "ps1", *SLOW_MACHINE, root=plain, timeout=600)
        boxed_log = boxed_run.result()
        plain_run.result()
    return {"tmp": tmp, "boxed": boxed, "plain": plain, "home": home, "log": boxed_log,
            "scores": _scores(boxed), "plain_scores": _scores(plain), "events": sandbox.read_events(events)}


def _student(scores: dict, student: str) -> dict[tuple[str, str], float]:
    return {(nb, gid): s for (st, nb, gid), s in scores.items() if st == student}


# ---- kernels started directly ------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _kernel(workdir: Path, manager=sandbox.SandboxedKernelManager, **traits):
    workdir.mkdir(parents=True, exist_ok=True)
    km = manager(kernel_name="python3", **traits)
    await km.start_kernel(cwd=str(workdir))
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        if await km.is_alive():
            await km.shutdown_kernel(now=True)
        else:
            await km.cleanup_resources()


async def _run(kc, code: str, timeout: float = 60) -> tuple[str, str]:
    """(reply status, stdout + error text) of one cell."""
    msg_id = kc.execute(textwrap.dedent(code))
    out = []
    while True:
        msg = await kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            out.append(f"{content['ename']}: {content['evalue']}")
        elif kind == "status" and content["execution_state"] == "idle":
            break
    while True:
        reply = await kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"]["status"], "".join(out)


async def _wait_dead(km, seconds: float) -> bool:
    for _ in range(int(seconds * 10)):
        if not await km.is_alive():
            return True
        await asyncio.sleep(0.1)
    return False


class _Channel:
    """Stands in for jupyter_client's iopub channel: its messages in order (an exception is raised), then Empty."""
    def __init__(self, messages):
        self.messages = list(messages)

    def get_msg(self, timeout=None):
        message = self.messages.pop(0) if self.messages else queue.Empty()
        if isinstance(message, Exception):
            raise message
        return message


class _AsyncChannel(_Channel):
    async def get_msg(self, timeout=None):
        return _Channel.get_msg(self, timeout)


@pytest.mark.parametrize("channel", [_Channel, _AsyncChannel], ids=["blocking", "async"])
def test_an_unreadable_output_message_is_skipped_and_counted(channel):
    """A kernel whose output thread failed in the middle of a multipart message (a process limit reached: "can't
    start new thread") sends frames out of order, which jupyter_client cannot read ("Invalid Signature"): the
    metered channel skips such a message, counts it, and returns the next one; Empty still ends a wait."""
    from grader.sandbox.client import instrument

    class Sandbox:
        test_sources, unreadable, metered = set(), 0, []

        def unreadable_message(self, error):
            self.unreadable += 1

        def count_output(self, msg):
            self.metered.append(msg)

    class Client:
        iopub_channel_class = channel
        execute = None

    client, box, good = Client(), Sandbox(), {"msg_type": "stream", "content": {"text": "ok"}}
    instrument(client, box)
    read = client.iopub_channel_class([ValueError("Invalid Signature: b'a9ed'"), ValueError("bad json"), good])
    got = read.get_msg(timeout=5)
    assert (asyncio.run(got) if channel is _AsyncChannel else got) == good
    assert box.unreadable == 2 and box.metered == [good]
    with pytest.raises(queue.Empty):
        read = client.iopub_channel_class([ValueError("Invalid Signature")])
        got = read.get_msg(timeout=0.5)
        asyncio.run(got) if channel is _AsyncChannel else got


# ---- 1-7 -------------------------------------------------------------------------------------------------------
@needs_sandbox
def test_reading_solutions_from_disk_gains_nothing(graded):
    plain, boxed = _student(graded["plain_scores"], "thief"), _student(graded["scores"], "thief")
    assert plain[("basic", "test_square")] == 2 and plain[("basic", "test_describe")] == 1, \
        "without the sandbox the thief finds solutions/ps1/basic.ipynb (the attack must be real)"
    assert boxed and sum(boxed.values()) == 0, boxed


@needs_sandbox
def test_writes_outside_the_working_copy_change_nothing(graded):
    own = graded["boxed"] / "autograded" / "vandal" / "ps1"
    report = (own / "mine.txt").read_text()          # the vandal ran, and could write its own working copy
    assert report.startswith("VANDALISED")
    attempts = json.loads(report.split(" ", 1)[1])
    assert attempts == {"seen": [], "written": []}, "the sandbox showed files outside the working copy"
    for path in graded["tmp"].rglob("*"):
        if path.is_file() and own not in path.parents:
            assert MARK not in path.read_bytes(), f"{path} was written by the vandal"
    assert (graded["home"] / "notes.txt").read_text() == "private\n"
    assert not list(graded["tmp"].rglob("vandal.txt"))
    with sqlite3.connect(graded["boxed"] / "gradebook.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for student in ("honest_a", "honest_b", "tamper"):
        assert (graded["boxed"] / "autograded" / student / "ps1" / "basic.ipynb").is_file()


@needs_sandbox
def test_network_connection_fails(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))   # the grader's own loopback: out of reach too
    port = server.getsockname()[1]
    code = f"""
        import socket
        for address in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("10.0.0.1", 80)):
            s = socket.socket()
            s.settimeout(3)
            try:
                s.connect(address)
                print("connected", address)
            except OSError as exc:
                print("refused", address, type(exc).__name__)
        """

    async def go():
        async with _kernel(tmp_path / "autograded" / "net" / "ps1") as (km, kc):
            return await _run(kc, code)

    status, out = asyncio.run(go())
    server.setblocking(False)
    with pytest.raises(BlockingIOError):               # nothing waits in the listener's backlog
        server.accept()
    server.close()
    assert status == "ok" and "connected" not in out and out.count("refused") == 3, out


@needs_sandbox
def test_memory_bomb_is_stopped_with_a_reason(graded):
    """The bomb's allocation fails at the limit (MemoryError in its cell): recorded as a memory limit, the notebook
    graded (never an integrity failure), its other answers keep their points."""
    limits = [e for e in graded["events"] if e["event"] == "limit"]
    assert [(e["student"], e["kind"]) for e in limits] == [("bomb", "memory")], graded["events"]
    assert "1.00 GiB" in limits[0]["reason"]
    assert not [e for e in graded["events"] if e["event"] == "integrity" and not e.get("graded")], graded["events"]
    assert graded["log"] == "", f"every notebook must be graded:\n{graded['log']}"
    bomb = {key: score for key, score in _student(graded["scores"], "bomb").items() if key[0] == "basic"}
    assert bomb == {("basic", "test_square"): 0, ("basic", "test_describe"): 1}, bomb
    assert _student(graded["scores"], "honest_a")[("basic", "test_square")] == 2, "the batch went on after the bomb"


@needs_sandbox
def test_fork_bomb_is_stopped(tmp_path):
    async def go():
        async with _kernel(tmp_path / "autograded" / "forks" / "ps1", sandbox_processes=64) as (km, kc):
            uid = km._sb.uid
            kc.execute("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
            dead = await _wait_dead(km, 30)
            return dead, km._sb.hit if km._sb else None, uid, km
    dead, hit, uid, km = asyncio.run(go())
    assert dead, "the fork bomb was not stopped within 30 s"
    assert hit and hit["kind"] == "processes", hit
    assert km.sandbox_outcome["limit"]["kind"] == "processes"
    if uid is not None:                              # root mode: nothing runs as the kernel's uid any more
        left = [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]
        assert left == []


def _uid_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@needs_sandbox
def test_tampering_gains_nothing(graded):
    plain, boxed = graded["plain_scores"], graded["scores"]
    assert sum(_student(plain, "tamper").values()) > sum(_student(plain, "honest_b").values()), \
        "without the guard the tampering must pay off (the attack must be real)"
    assert _student(boxed, "tamper") == _student(boxed, "honest_b")
    flags = " ".join(f for e in graded["events"] if e["event"] == "tamper" and e["student"] == "tamper"
                     for f in e["flags"])
    for what in ("course.checks.check", "assert_close", "isinstance", "run_code", "showtraceback", "abs"):
        assert what in flags, f"{what!r} missing from the tamper flags: {flags}"
    assert not [e for e in graded["events"] if e["event"] == "tamper" and e["student"] in ("honest_a", "honest_b")]


@needs_sandbox
def test_honest_class_graded_inside_matches_outside(graded):
    for student in ("honest_a", "honest_b"):
        inside, outside = _student(graded["scores"], student), _student(graded["plain_scores"], student)
        if student == "honest_b":       # graded unsandboxed without its tensors notebook (see _submit)
            inside = {k: v for k, v in inside.items() if k[0] == "basic"}
            outside = {k: v for k, v in outside.items() if k[0] == "basic"}
        assert inside and inside == outside, student
    assert sum(_student(graded["scores"], "honest_a").values()) == 4
    assert sum(_student(graded["scores"], "honest_b").values()) == 0


# ---- more ------------------------------------------------------------------------------------------------------
@needs_sandbox
@pytest.mark.parametrize("first", ["", "raise MemoryError()"])
def test_removing_the_guard_fails_the_notebook(tmp_path, first):
    """Also after a MemoryError the kernel raised itself (only a real shortage excuses a silent guard)."""
    async def go():
        async with _kernel(tmp_path / "autograded" / "hooks" / "ps1") as (km, kc):
            if first:
                await _run(kc, first)
            await _run(kc, "ip = get_ipython()\nfor cbs in ip.events.callbacks.values():\n    cbs.clear()")
            await _run(kc, "x = 1")
    with pytest.raises(sandbox.SandboxIntegrityError, match="hooks were removed"):
        asyncio.run(go())


def test_an_interrupted_cell_may_lack_its_guard_report_but_no_other_cell():
    """A SIGINT that lands before IPython runs the cell (a cell over its time limit, a busy machine) ends it without
    the guard's report: one missing report per interrupt is allowed, one more is still an integrity error."""
    from types import SimpleNamespace

    from grader.sandbox.box import KernelSandbox

    box = KernelSandbox.__new__(KernelSandbox)  # only the verdict's inputs: no kernel, no folders
    box.km, box.workdir = SimpleNamespace(sandbox_event=lambda *a, **k: None), Path("work")
    box.integrity_expected, box.ready, box.hit, box.memory_error = True, True, None, None
    box.executes, box.posts, box.interrupts = 3, 2, 1
    assert box._integrity_error(alive=True) is None
    box.posts = 1
    assert isinstance(box._integrity_error(alive=True), sandbox.SandboxIntegrityError)
    box.posts, box.interrupts = 2, 0
    assert isinstance(box._integrity_error(alive=True), sandbox.SandboxIntegrityError)


@needs_sandbox
def test_in_test_tampering_fails_the_test(tmp_path):
    """A solution that replaces a checker while the test cell runs fails that test."""
    async def go():
        async with _kernel(tmp_path / "autograded" / "sneaky" / "ps1") as (km, kc):
            await _run(kc, "def answer():\n    import course.checks\n    course.checks.check = lambda *a, **k: None\n"
                           "    return 41")
            return await _run(kc, 'def __check_answer():\n    from course import checks\n'
                                  '    checks.check(answer() == 42, "the answer", "add one")\n'
                                  '__check_answer(); del __check_answer')
    status, out = asyncio.run(go())
    assert status == "error" and "GraderIntegrityError" in out, out


@needs_sandbox
@pytest.mark.parametrize("part", ["__code__", "__defaults__", "__kwdefaults__"])
def test_a_checker_rewritten_through_library_code_fails_the_test(tmp_path, part):
    """The guard compares the protected functions' code and defaults only after CPython audited a write to one (to
    spare an audit call per function and cell): a write made by library code, which is not refused as the student's
    own frame would be, is still found, fails the test and is put back."""
    async def go():
        async with _kernel(tmp_path / "autograded" / "wrapped" / "ps1") as (km, kc):
            for _ in range(2):                      # the guard's checks, with nothing written, before the attack
                await _run(kc, "from course import checks")
            await _run(kc, "def answer():\n    import functools\n    from course import checks\n"
                           "    def fake(condition, what='', hint='', *, k=None):\n        return None\n"
                           f"    functools.update_wrapper(checks.check, fake, assigned=({part!r},), updated=())\n"
                           "    return 41")
            tested = await _run(kc, 'def __check_answer():\n    from course import checks\n'
                                    '    checks.check(answer() == 42, "the answer", "add one")\n'
                                    '__check_answer(); del __check_answer')
            after = await _run(kc, "print(checks.check.__code__.co_name, checks.check.__defaults__, "
                                   "checks.check.__kwdefaults__)")
            return tested, after
    (status, out), after = asyncio.run(go())
    assert status == "error" and "GraderIntegrityError" in out and part in out, out
    assert after == ("ok", "check None None\n"), "the checker's code and defaults must be put back"


@needs_sandbox
def test_limits_go_on_through_the_launcher_inside_the_sandbox(tmp_path):
    """The sandboxed manager is grader.kernel's manager: its launch.py rlimits apply inside, and the kernel is boxed."""
    async def go():
        async with _kernel(tmp_path / "autograded" / "comp" / "ps1", memory_limit=3 << 30,
                           sandbox_cpu=600) as (km, kc):
            return await _run(kc, f"""
                import os, resource
                print(os.path.exists({str(nbtools.ROOT / "solutions")!r}),
                      ",".join(sorted(os.listdir({str(nbtools.ROOT)!r}))),
                      resource.getrlimit(resource.RLIMIT_DATA)[1], resource.getrlimit(resource.RLIMIT_CPU)[0],
                      resource.getrlimit(resource.RLIMIT_CORE)[1], os.getuid() != 0)
                """)
    status, out = asyncio.run(go())
    assert status == "ok" and out.split() == ["False", ".venv,course", str(3 << 30), "600", "0", "True"], out


@needs_sandbox
def test_isolation_details_and_interrupts(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_TEST_SECRET", "hunter2")
    work = tmp_path / "autograded" / "iso" / "ps1"
    work.mkdir(parents=True)
    (work / "ps1.ipynb").write_text('{"source": "### BEGIN HIDDEN TESTS"}')
    (work / "data.csv").write_text("1,2\n")
    code = f"""
        import json, os, subprocess
        print(json.dumps({{
            "notebook": open("ps1.ipynb").read(), "data": open("data.csv").read(), "uid": os.getuid(),
            "caps": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0],
            "secret": os.environ.get("GRADER_TEST_SECRET"), "home": os.path.expanduser("~"),
            "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "repo": sorted(os.listdir({str(nbtools.ROOT)!r})), "wrote": open("out.txt", "w").write("ok"),
            "tmp": open("/tmp/t", "w").write("ok")}}))
        """

    async def go():
        async with _kernel(work) as (km, kc):
            status, out = await _run(kc, code)
            # stop_on_error=False, as nbgrader's executor sends every cell: otherwise ipykernel aborts the requests
            # that arrive while it clears its queue after the KeyboardInterrupt, and 'alive' reads "aborted" (a race)
            msg_id = kc.execute("import time\nwhile True:\n    time.sleep(0.01)", stop_on_error=False)
            await asyncio.sleep(1)
            await km.interrupt_kernel()
            while (reply := await kc.get_shell_msg(timeout=30))["parent_header"].get("msg_id") != msg_id:
                pass
            after = await _run(kc, "print('alive')")
            return status, out, reply["content"].get("ename"), after
    status, out, interrupted, after = asyncio.run(go())
    seen = json.loads(out)
    assert status == "ok"
    assert seen["notebook"] == "" and seen["data"] == "1,2\n", "notebooks (hidden tests) must read as empty"
    assert seen["uid"] != 0 and seen["caps"] == "0000000000000000"
    assert seen["secret"] is None and seen["home"] == sandbox.INSIDE_HOME
    assert seen["repo"] == [".venv", "course"], "of the repository only the environment and the library show"
    assert len(seen["processes"]) <= 3, seen["processes"]      # bwrap's init, the kernel, maybe a helper
    assert (work / "out.txt").read_text() == "ok" and os.stat(work / "out.txt").st_uid == os.geteuid()
    assert interrupted == "KeyboardInterrupt" and after == ("ok", "alive\n"), "an interrupt must not end the kernel"


@needs_sandbox
def test_warm_compile_cache_is_read_and_never_written(tmp_path):
    """A kernel starts with the warm cache in its TORCHINDUCTOR_CACHE_DIR; what it writes there stays its own."""
    from grader.compile_cache import freeze

    warm = tmp_path / "warm"
    (warm / "fxgraph").mkdir(parents=True)
    (warm / "fxgraph" / "entry").write_text("compiled")
    freeze(warm)

    async def go():
        async with _kernel(tmp_path / "autograded" / "cc" / "ps1", compile_cache=str(warm)) as (km, kc):
            return await _run(kc, """
                import os, pathlib
                cache = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
                entry = cache / "fxgraph" / "entry"
                print(entry.read_text())
                try:
                    entry.write_text("poisoned")
                except OSError:
                    entry.unlink()                      # a private layer: its own name for the file, at most
                    entry.write_text("poisoned")
                (cache / "fxgraph" / "mine").write_text("new")
                print(sorted(p.name for p in (cache / "fxgraph").iterdir()))
                """)
    status, out = asyncio.run(go())
    assert status == "ok" and out.split("\n")[:2] == ["compiled", "['entry', 'mine']"], out
    assert sorted(p.name for p in (warm / "fxgraph").iterdir()) == ["entry"]
    assert (warm / "fxgraph" / "entry").read_text() == "compiled"


@needs_sandbox
def test_user_namespace_identity(tmp_path):
    """identity=userns (what a non-root grader gets): uid 1000 inside, and no further namespaces."""
    async def go():
        async with _kernel(tmp_path / "autograded" / "userns" / "ps1", identity="userns") as (km, kc):
            return await _run(kc, """
                import os, subprocess
                made = subprocess.run(["unshare", "--user", "true"], capture_output=True).returncode == 0
                print(os.getuid(), made, os.path.exists("/work/main/solutions"))
                """)
    status, out = asyncio.run(go())
    assert status == "ok" and out.split() == [str(sandbox.USERNS_ID), "False", "False"], out


@needs_sandbox
def test_output_flood_is_stopped(tmp_path):
    async def go():
        async with _kernel(tmp_path / "autograded" / "flood" / "ps1", sandbox_output="200k") as (km, kc):
            kc.execute("while True:\n    print('x' * 10000)")
            for _ in range(3000):                        # read output, as nbclient does, until the kernel ends
                with contextlib.suppress(queue.Empty):
                    await kc.get_iopub_msg(timeout=0.01)
                if not await km.is_alive():
                    break
            return km
    km = asyncio.run(go())
    assert km.sandbox_outcome["limit"]["kind"] == "output", km.sandbox_outcome


def test_without_a_sandbox_grading_still_works_and_warns(tmp_path, monkeypatch, caplog):
    """Where bwrap is missing (macOS...): kernels run unisolated, with one loud warning and the guard still on."""
    monkeypatch.setattr(sandbox.probe, "_status", (False, "pretend: bubblewrap is not installed"))
    monkeypatch.setattr(sandbox.probe, "_warned", False)
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("GRADER_SANDBOX_EVENTS", str(events))
    monkeypatch.delenv("GRADER_SANDBOX", raising=False)

    async def go():
        outs = []
        for _ in range(2):
            async with _kernel(tmp_path / "autograded" / "mac" / "ps1") as (km, kc):
                await _run(kc, "import builtins\nbuiltins.len = lambda *a: 0")
                outs.append(await _run(kc, "print(len([1, 2, 3]))"))
        return outs
    with caplog.at_level("WARNING"):
        outs = asyncio.run(go())
    assert outs == [("ok", "3\n")] * 2, "the integrity guard must work without the sandbox too"
    assert sum("GRADING IS NOT ISOLATED" in r.getMessage() for r in caplog.records) == 1
    assert [e["event"] for e in sandbox.read_events(events)].count("unisolated") == 2
    monkeypatch.setenv("GRADER_SANDBOX", "require")
    with pytest.raises(sandbox.SandboxUnavailable, match="pretend"):
        asyncio.run(go())
