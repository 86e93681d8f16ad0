"""What people look at: the dashboard, plots and the asv bridge."""
