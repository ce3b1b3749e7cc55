"""kvgate's HTTP face: a request's flow and its rooms. Uses semantic/ and engine/, never the reverse."""
