"""What several backends share: common definition fields, load overrides, the managed-server
spec and engine, the upstream HTTP client, the chat client and forwarding, threaded token streams,
and chat-template prompts."""
