"""trainops"""
