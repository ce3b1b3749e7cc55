"""The HTTP door: the app, its routes, auth, dependencies, bodies, rendering, and the workers serving it."""
