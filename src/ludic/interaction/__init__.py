"""ludic.interaction"""
