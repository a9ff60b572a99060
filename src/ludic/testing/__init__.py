"""ludic.testing"""
