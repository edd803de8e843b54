"""The console bridge: one upstream VMI console connection per attempt, shared by every viewer."""
