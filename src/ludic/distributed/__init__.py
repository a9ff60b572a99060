"""ludic.distributed"""
