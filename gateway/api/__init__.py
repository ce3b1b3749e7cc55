"""What kvgate's API is made of, shared by every room: OpenAI's objects, the errors kvgate returns, ids."""
