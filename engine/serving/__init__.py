"""The step loop served to the gateway: on a thread of this process, or as an engine process on a socket."""
