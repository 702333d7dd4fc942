"""conch.engine"""
