"""hpcwatch.assess"""
