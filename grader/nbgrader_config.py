"""nbgrader configuration for the course.

nbgrader finds this file through JUPYTER_CONFIG_PATH=grader (the Makefile and grader.nbtools set it).

The source notebooks live in `solutions/` and the released student versions in `exercises/`, which is
committed so that learners and Colab can open it directly.
"""
from pathlib import Path

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

c.CourseDirectory.root = str(Path(__file__).resolve().parent.parent)
c.CourseDirectory.course_id = "gpu-course"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# Cell timeout in seconds. The slowest cells are a first torch.compile on CPU (8-27 s on a 2-core machine,
# measured on the machines used to build this course) and the capstone's short training run; 180 s leaves room for a
# busy grader.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.enforce_metadata = True
c.ClearHiddenTests.enforce_metadata = True
c.ClearOutput.enabled = True
