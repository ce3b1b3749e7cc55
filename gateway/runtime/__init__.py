"""What a kvgate process runs on: settings, its store (external or embedded), allocator, background tasks."""
