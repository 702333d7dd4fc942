"""conch.rl"""
