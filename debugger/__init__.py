"""The step-through debugger: a Textual app (app.py) over a UI-free stepping session (session.py)."""
