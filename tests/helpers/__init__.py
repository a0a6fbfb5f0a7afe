"""What several test files share, in one place (no test file imports another): running the scripts, tiny assets, the
one-line error assertion, the labelling tool's calls, a local HTTP server, the runs' audit events, a PPO update's inputs."""
