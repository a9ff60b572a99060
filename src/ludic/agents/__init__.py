"""ludic.agents"""
