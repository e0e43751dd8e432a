"""`python -m grader`: the instructor's command line (see `python -m grader --help`)."""
from grader.cli import main

raise SystemExit(main())
