"""skills"""
