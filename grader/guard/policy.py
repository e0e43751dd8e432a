"""The guard's policy: what it protects and restores, and what it refuses when the student's code does it.

Plain data and two predicates, read by the rest of the guard (grader/scan.py lists the same operations by name for its
static look at answers).
"""


PROTECTED_EXTRA = frozenset({"torch.testing", "torch.testing._comparison", "numpy.testing",
                             "numpy.testing._private.utils"})
# Modules too big (or patched by the course itself: course.simgpu swaps torch.cuda, Tensor.pin_memory...) to
# freeze whole: only the names that checks and test cells compare with are held to their imported values.
TENSOR_NAMES = ("equal", "allclose", "isclose", "eq", "ne", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
                "__ge__", "__abs__", "__sub__", "__bool__", "__float__", "__int__", "__len__", "__iter__",
                "__getitem__", "abs", "all", "any", "item", "tolist", "detach", "cpu", "numel", "sub", "isnan",
                "isfinite", "float", "double", "size", "dim", "shape", "dtype", "device")
WATCHED = {"math": None,            # None: every callable of the module
           "torch": ("equal", "allclose", "isclose", "eq", "ne", "all", "any", "abs", "isnan", "isfinite", "Tensor"),
           "warnings": ("catch_warnings", "simplefilter", "filterwarnings", "resetwarnings", "warn"),
           "json": ("dumps", "loads", "dump", "load", "JSONEncoder", "JSONDecoder"),
           "json.encoder": None,
           "contextlib": None,
           "numpy": ("asarray", "array_equal", "allclose", "isclose", "abs", "maximum", "where", "isnan", "argmax",
                     "iscomplexobj", "unravel_index", "all", "any", "ndarray"),
           "threading": ("Thread",),     # and Thread.start, which the guard wraps (blame.py)
           "faulthandler": ("dump_traceback", "dump_traceback_later")}   # wrapped too (ipykernel patches enable)
FAULTHANDLER = WATCHED["faulthandler"]
WATCHED_CLASSES = {"torch": ("Tensor", TENSOR_NAMES), "threading": ("Thread", ("start",))}
MACHINERY = ("IPython.core.interactiveshell", "IPython.core.ultratb", "IPython.core.events",
             "IPython.core.compilerop", "IPython.core.displayhook", "IPython.core.displaypub",
             "IPython.core.async_helpers", "IPython.display", "IPython.core.display_functions",
             "IPython.core.display", "ipykernel.zmqshell", "ipykernel.ipkernel", "ipykernel.kernelbase",
             "ipykernel.compiler", "ipykernel.displayhook", "jupyter_client.session", "zmq.sugar.socket",
             "IPython.core.inputtransformer2")
# Builtins that IPython and ipykernel themselves rebind while cells run (input is swapped for every execution).
VOLATILE_BUILTINS = frozenset({"input", "raw_input", "_", "__", "___", "exit", "quit", "get_ipython", "display",
                               "__IPYTHON__", "help", "copyright", "credits", "license", "dreload", "runfile",
                               "execfile"})
SHELL_ATTRS = ("InteractiveTB", "SyntaxTB", "CustomTB", "custom_exceptions", "compile", "events", "displayhook",
               "display_pub", "display_trap", "builtin_trap", "input_transformer_manager", "user_ns",
               "user_module", "ast_transformers", "input_transformers_cleanup", "input_transformers_post", "kernel")
KERNEL_ATTRS = ("shell", "session", "iopub_socket", "shell_handlers", "control_handlers")
SESSION_ATTRS = ("pack", "unpack", "auth", "key", "signature_scheme")
BLOCKED_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "sys.addaudithook"})
WATCHED_EVENTS = frozenset({"gc.get_referrers", "gc.get_referents", "gc.get_objects"})
# Refused, and reported for review, when the code that does it directly is the student's (a graded cell, or a
# function defined in one): no honest answer to this course needs them (grader/scan.py lists the same by name).
STUDENT_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._getframemodulename", "gc.get_objects",
                            "gc.get_referrers", "gc.get_referents", "exec", "compile", "code.__new__",
                            "function.__new__", "sys.settrace",
                            "sys.setprofile", "sys.addaudithook", "marshal.loads", "cpython.run_command"})
STUDENT_PREFIXES = ("ctypes.", "sys.monitoring.", "cpython._PySys_ClearAuditHooks")
# Done by the standard library on its own behalf in honest code when the frame that does it and its caller are of the
# same module family (blame.py): importing compiles and runs a module's source, dataclasses builds methods from its own
# templates, logging and enum find their caller's frame. Called from outside, the same code only passes it on.
OWN_BEHALF = {"compile": ("importlib", "dataclasses"), "exec": ("importlib", "dataclasses"),
              "marshal.loads": ("importlib",),
              "sys._getframe": ("logging", "enum", "typing", "dataclasses", "collections"),
              "sys._getframemodulename": ("enum", "typing", "collections")}
# ... whoever calls it: namedtuple evaluates its own template, made of field names it has checked
ALWAYS_OWN = {event: (("collections", "namedtuple"),) for event in ("compile", "exec", "sys._getframe",
                                                                      "sys._getframemodulename", "object.__setattr__")}
ALWAYS_OWN["object.__setattr__"] += (("typing", "__new__"),)   # typing.NamedTuple sets the __bases__ of its class
ALWAYS_OWN["compile"] += (("ast", "parse"),)   # a tree, not code (traceback parses a line to place its carets)
# traceback's formatting reads each traceback entry's frame for itself (print_exc, format_exc, logging.exception):
# it hands back text, not frames; walk_tb hands the frames to its caller (blame.py checks the frames are no test's)
ALWAYS_OWN["object.__getattr__"] = (("traceback", "extract"), ("traceback", "_extract_from_extended_frame_gen"))
# installed code that only passes an operation on for its caller ("*": every function of the module): IPython's
# `open` (the notebook's builtin), numpy's ctypes helpers
RELAYS = frozenset({("IPython.core.interactiveshell", "_modified_open"), ("numpy.ctypeslib", "*"),
                    ("numpy._core._internal", "*"), ("numpy.core._internal", "*")})
GETATTR_REFUSED = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "__code__", "__globals__", "f_back"})
# of object.__setattr__/__delattr__ (audited for functions and for types' special attributes): what changes code or
# a class's layout; a class's __doc__, __name__ or __module__ is the student's to set
SETATTR_REFUSED = frozenset({"__code__", "__bases__", "__class__", "__defaults__", "__kwdefaults__", "__dict__",
                             "__mro__", "__globals__", "__closure__"})
# a function's replaceable parts (_FunctionSnap): CPython audits every write to them (object.__setattr__ or
# object.__delattr__, Python 3.8+), and reading __code__ as well, which costs an audit call per protected function
FUNCTION_PARTS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
PROC_SELF = ("/proc/self", "/proc/thread-self")
GRADING_MODULE, GRADING_FLAG = "course._testcell", "_GUARDED"  # True: test cells raise their failures (graded mode)
GRADING_VARIABLE = "NBGRADER_EXECUTION"  # set by nbgrader's validate and autograde; course.checks reads it too
PRISTINE = "__grader_builtins__"      # notebook-level name through which test cells read pristine builtins
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"


def _proc_self(path):
    """Whether `path` is one of the kernel's own /proc entries (its memory, command line, file descriptors)."""
    parts = path.split("/")
    return path.startswith(PROC_SELF) or (len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit())


def _cell_code(filename):
    """Whether code with this co_filename was compiled from a notebook cell (IPython's or ipykernel's names)."""
    return isinstance(filename, str) and (filename.startswith("<ipython-input-") or "/ipykernel_" in filename)
