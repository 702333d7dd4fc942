"""conch.agent"""
