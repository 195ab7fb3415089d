# deprecated name; use configs/_base_/models/redet-le90_re50_refpn.py
_base_ = './redet-le90_re50_refpn.py'
