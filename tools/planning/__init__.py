"""Planning: checkpoint interval, effective training time, parallel layouts and where they land."""
