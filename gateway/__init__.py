"""kvgate's HTTP face: settings, the FastAPI app, the CLI. Imports semantic/ and engine/, never the reverse."""
