"""conch.moe"""
