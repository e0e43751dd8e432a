"""Mutation catalogue for solutions/10-scaling/scaling.ipynb: typical learner mistakes and correct variants.

One private file per topic (tests/mutations/_scaling_<topic>.py, a leading underscore: not a catalogue of its own),
gathered here.
"""
from tests.mutations._scaling_comm import VARIANTS as COMM
from tests.mutations._scaling_memory import VARIANTS as MEMORY
from tests.mutations._scaling_overlap import VARIANTS as OVERLAP
from tests.mutations._scaling_resume import VARIANTS as RESUME
from tests.mutations._scaling_zero import VARIANTS as ZERO

NB = "10-scaling/scaling.ipynb"
VARIANTS = [*MEMORY, *ZERO, *COMM, *OVERLAP, *RESUME]
