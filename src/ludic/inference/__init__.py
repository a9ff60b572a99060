"""ludic.inference"""
