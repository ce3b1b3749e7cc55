"""The Redis store, source of truth: entries, their scopes, the Lua scripts, purges and the change stream."""
