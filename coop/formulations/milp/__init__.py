"""The 0-1 programs the stage formulations build (LinearModel) and the backends that solve them (OR-Tools, PuLP)."""
