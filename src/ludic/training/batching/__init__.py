"""ludic.training.batching"""
