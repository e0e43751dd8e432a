"""What crosses between a grading kernel's guard and the grader, written once for both sides.

The grader (grader/sandbox/box.py) starts the kernel through boot.py with a JSON config read once from an inherited
pipe (CONFIG_KEYS); the guard reports on another pipe, one JSON line per event (`report_line`, read back by
`read_report`): each line carries the config's token, which the grader checks, the event name (EVENTS) and its fields.
A test cell the guard failed or refused shows one of ERRORS as its error name (grader/outcome.py reads them back).
The course's sealed logs (course/ledger.py) raise FORGED_EVENT, an audit event, when a record is forged.
"""
import json

CONFIG_KEYS = ("limits", "uid", "gid", "report_fd", "token", "test_marker", "isolated", "course_dir", "graded",
               "answers", "home", "neutral_dir")
# start: the guard is installed; ready: attached to the kernel (notebook code may run); pre/post: around each cell
# (post has "failed": the guard failed a test cell); review: an operation held for review ("what", "cell", "line");
# no-ipykernel: the kernel command was not ipykernel's (the guard runs it, unattached). Every event may carry "flags":
# what the guard restored or blocked, in words.
EVENTS = ("start", "ready", "pre", "post", "review", "no-ipykernel")
MAX_LINE = 3800          # characters of one report line; a longer one is cut (flags are kept short)
# raised by course.ledger (its AUDIT_EVENT) when a sealed log refuses a write or finds a record changed after it was
# made: a forged fact the hidden tests rely on, held for review wherever it came from
FORGED_EVENT = "course.forged_record"
# raised by course.distributed's Ranks.run (course._rankguard.RANK_EVENT) for each thing a rank worker refused or found
# forged while it ran the notebook's code in a process of its own: held for review like the kernel's own
RANK_EVENT = "course.rank_worker"
# raised by the guard itself when code other than its own asks for its state (imports._keep_guard): held for review
REACHED_EVENT = "grader.guard_reached"


class GraderIntegrityError(RuntimeError):
    """Shown as the error of a test cell during which protected code was replaced."""


class NotWrittenInNotebook(RuntimeError):
    """Shown as the error of a test cell whose graded name holds imported code (grader/outcome.py reads its text)."""


ERRORS = (GraderIntegrityError.__name__, NotWrittenInNotebook.__name__)


def report_line(token, event, **fields):
    """One report, as the bytes the guard writes."""
    return (json.dumps({"token": token, "ev": event, **fields}, default=str)[:MAX_LINE] + "\n").encode()


def read_report(line, token):
    """A report line's fields (with "ev"), or None when it is not JSON or not signed with `token`."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and msg.get("token") == token else None
