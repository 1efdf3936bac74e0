"""What engines are handed: the typed request, chat messages, chat templates and prompt formats."""
