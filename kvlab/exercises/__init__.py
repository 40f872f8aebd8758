"""Checkers for the notebooks' exercises, one module per lesson (``from kvlab.exercises import
lesson02``).

Each checker takes the student's answer, returns a short verdict string, and raises nothing for a
wrong answer (a hint is part of the verdict); ``None`` means "not answered yet".
"""
