"""The shop's tables: stock, orders, their payments and shipments, and the customer's notifications."""

from __future__ import annotations

from django.db import models


class Stock(models.Model):
    sku = models.CharField(max_length=20, primary_key=True)
    qty = models.IntegerField()


class Order(models.Model):
    sku = models.CharField(max_length=20)
    cents = models.IntegerField()
    status = models.CharField(max_length=20, default="new")


class Payment(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    cents = models.IntegerField()


class Shipment(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)


class Notification(models.Model):
    """What the e-mail provider was asked to send: written after the run committed (``on_commit``)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
