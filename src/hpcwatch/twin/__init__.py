"""hpcwatch.twin"""
