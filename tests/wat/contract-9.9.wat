;; A component built against a newer contract: it exports `slinky:builder/plugin@0.2.0`.
(component
  (core module $m
    (func (export "describe") unreachable))
  (core instance $i (instantiate $m))
  (func $describe (canon lift (core func $i "describe")))
  (instance $plugin (export "describe" (func $describe)))
  (export "slinky:builder/plugin@0.2.0" (instance $plugin)))
