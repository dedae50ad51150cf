"""Reaching a recorded run: its endpoint and token, a tunnel through the login node."""
