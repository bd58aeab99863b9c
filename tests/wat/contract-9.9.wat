;; A component built against a contract newer than the host knows: it exports `slinky:builder/plugin@9.9.0`.
(component
  (core module $m
    (func (export "describe") unreachable))
  (core instance $i (instantiate $m))
  (func $describe (canon lift (core func $i "describe")))
  (instance $plugin (export "describe" (func $describe)))
  (export "slinky:builder/plugin@9.9.0" (instance $plugin)))
