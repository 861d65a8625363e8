"""Pre-ranking model of the CTR cascade."""
