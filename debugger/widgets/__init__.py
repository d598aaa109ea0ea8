"""One panel per module; each has `show(...)` taking a snapshot from debugger.session."""
