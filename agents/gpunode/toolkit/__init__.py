"""The container toolkit: CDI specs and container runtime configuration."""
