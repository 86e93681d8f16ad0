"""The parent process of a GPU sweep: plans engine groups, runs each in a worker, appends records durably."""
