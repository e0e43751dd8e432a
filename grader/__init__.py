"""Instructor tooling for the course: nbgrader configuration, release checks and class grading."""
