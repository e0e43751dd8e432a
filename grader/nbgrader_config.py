"""nbgrader configuration for the course.

nbgrader finds this file through JUPYTER_CONFIG_PATH=grader (the Makefile and grader.nbtools set it).

The source notebooks live in `solutions/` and the released student versions in `exercises/`, which is
committed so that learners and Colab can open it directly.
"""
from pathlib import Path

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

ROOT = Path(__file__).resolve().parent.parent
c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "gpu-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# Cell timeout in seconds. The slowest cells are a first torch.compile on CPU (8-27 s on a 2-core machine,
# measured on the machines used to build this course) and the capstone's short training run; 180 s leaves room
# for a busy grader.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True

# The nbgrader menu under `make lab`: the Assignment List and the course list read an exchange folder, by default
# /usr/local/share/nbgrader/exchange, which a laptop does not have (every request then logs an ExchangeError). A
# course-local, git-ignored folder makes both pages work; it holds something only if someone releases through it.
EXCHANGE = ROOT / ".exchange"
c.Exchange.root = str(EXCHANGE)
try:
    EXCHANGE.mkdir(exist_ok=True)   # nbgrader requires it to exist
except OSError:                     # a read-only checkout: the Assignment List says so, grading is unaffected
    pass
# Formgrader's "Manage Assignments" page would print the whole server configuration (a debugging aid) and log
# "Formgrader config is not serializable" on every visit.
c.FormgradeExtension.debug = False

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.enforce_metadata = True
c.ClearHiddenTests.enforce_metadata = True
c.ClearOutput.enabled = True

# Feedback pages keep hidden tests hidden (grader/hidetests.py): each hidden-test region shows as one line, and the
# cell keeps only its reason. Set `c.HideHiddenTests.enabled = False` to show learners the hidden tests whole.
c.GenerateFeedback.preprocessors = ["nbgrader.preprocessors.GetGrades",
                                    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
                                    "grader.hidetests.HideHiddenTests"]
