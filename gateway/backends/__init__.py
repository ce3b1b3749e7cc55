"""What answers a cache miss: the Backend protocol, the engine (in process or its own), an upstream server."""
