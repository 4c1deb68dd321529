"""Figures: Gantt charts of schedules and simulation plots."""
