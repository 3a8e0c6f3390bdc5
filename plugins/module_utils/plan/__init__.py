"""The plan: the model's memory, the layout search and the deployment plan every part reads."""
