"""Simulation: the event-driven cluster simulator, trace mapping, truths and Sia's profiles."""
