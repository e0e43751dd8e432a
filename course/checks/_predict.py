"""Predictions: what the learner expects a measurement to show, written before the notebook measures it, and held
against that measurement afterwards.

Each module asks at least one question before a measurement (#35): the learner answers with one of a few named
choices in a small graded function (`predict_<what>()`), the notebook measures, and the test cell after the
measurement compares. The choice the measurement supports comes from the measurement itself (on the learner's GPU,
or the recorded or simulated figures the lesson shows without one), never from this module: a learner reading it
learns nothing about the answer. The hidden test grades the prediction against the lesson's own reasoning.
Used by every notebook.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course.checks import calling, check, expect_type, passed

__all__ = ["expect_prediction"]


def expect_prediction(predict: Callable[[], Any], choices: dict[str, str], measured: str, shown: str, why: str) -> None:
    """Hold the learner's prediction against the measurement the notebook just made.

    `predict`: the learner's predict_<what> function, called here with no arguments (an error it raises fails as one
    line with its fix); `choices`: each allowed answer with what it means; `measured`: the choice the measurement
    supports; `shown`: the measurement in words ("pinned copies ran at 25.7 GB/s, pageable ones at 10.0 GB/s");
    `why`: the lesson's explanation of the outcome, shown either way (as the Fix when the prediction missed). Used by
    every notebook.
    """
    __tracebackhide__ = True
    name = getattr(predict, "__name__", "your prediction function")
    with calling(f"{name}()", "return your prediction as one of the strings its docstring names"):
        predicted = predict()
    menu = ", ".join(f"{choice!r} ({meaning})" for choice, meaning in choices.items())
    expect_type(predicted, str, "your prediction", f"return one of {menu}")
    check(predicted in choices, f"your prediction {predicted!r} is not one of the choices", f"return one of {menu}")
    check(predicted == measured, f"you predicted {predicted!r} ({choices[predicted]}), but {shown}", why)
    passed(f"you predicted {predicted!r} ({choices[predicted]}), and {shown}. Why: {why}")
