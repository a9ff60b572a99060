"""ludic.training"""
