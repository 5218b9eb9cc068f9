"""The built-in backend: pure PyTorch, every device, lowest priority, bounded memory."""
