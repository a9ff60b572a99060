"""ludic.eval"""
