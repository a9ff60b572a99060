"""ludic.context"""
